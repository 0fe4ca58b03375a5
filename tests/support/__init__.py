"""Helpers the tests share: the one place a test module imports from besides optlab."""
