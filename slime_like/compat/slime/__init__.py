"""slime_like's stand-in for slime's plugin API (loaded as `slime` only when the real slime is absent).

What is covered and how it differs from slime: docs/plugins.md, "Plugins written for slime".
"""
