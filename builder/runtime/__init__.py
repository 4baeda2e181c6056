"""Modules that run inside Triton's python backend; each is copied into a model as ``model.py``.

They import nothing from ``builder``: the serving environment need not have it installed.
"""
