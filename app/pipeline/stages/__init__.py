"""The stages of /recommend, each a small component with its clients injected."""
