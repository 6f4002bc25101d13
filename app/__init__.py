"""Online recommendation serving."""
