"""Markdown report sections and matplotlib plots (torch-free)."""
