"""Presentation: one renderer per output format. Renderers format; they never compute."""
