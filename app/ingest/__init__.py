"""The ingest consumer (`recsys-ingest`): applies the event log to what /recommend reads."""
