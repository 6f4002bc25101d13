"""The world build's heavy steps as Spark jobs: build-world --engine spark."""
