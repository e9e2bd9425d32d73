"""Fast in-process tests: the router app and fake workers as real aiohttp servers in one loop."""
