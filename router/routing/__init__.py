"""Routing: from a parsed request to a ranked list of workers, and what is learned after.

key -> candidates -> signals -> rank -> (forward, at the edge) -> complete. Nothing here
imports aiohttp or Redis: the edge (router/server/handlers.py, the bench, tests) drives the
pipeline, and stores come in through their interfaces.
"""
