"""slime.utils: the Sample type, HTTP helpers, function loading and the async runner."""
