"""Minimal extensions written as a user would add them; tests run them and the docs quote them."""
