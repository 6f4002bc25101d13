"""Building the world the service serves: catalog, users, FAISS index, ranking model."""
