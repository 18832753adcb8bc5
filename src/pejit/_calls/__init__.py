"""The call path: from a call's arguments to its specialization, and the caches on the way."""
