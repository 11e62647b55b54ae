"""The upstream source of truth (pull mode): hollow's lookup contract over injected httpx."""
