"""Candidate filters, one reason each, and the backfill that follows them."""
