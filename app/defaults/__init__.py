"""Files shipped with the package: the feature schema and the default rules."""
