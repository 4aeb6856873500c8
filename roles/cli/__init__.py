"""TODO: what this room is for and what it may import."""
