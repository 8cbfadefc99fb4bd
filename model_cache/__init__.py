"""Per-model cache of the chosen backend plan and its compiled artefacts. A library with no HTTP in it."""

from model_cache.cache import BrokenEntry, CacheEntry, CacheReadOnly, ModelCache, cache_key, hash_files

__all__ = ["BrokenEntry", "CacheEntry", "CacheReadOnly", "ModelCache", "cache_key", "hash_files"]
