"""The process around the requests: start-up, admission, readiness, reloads, workers, drain."""
