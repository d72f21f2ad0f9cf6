"""Stand-ins for other frameworks' plugin APIs, so plugins written for them run here unchanged.

`compat/slime/` is imported as `slime`, and only when the real slime is not installed: the plugin loader
appends a finder for it at the end of `sys.meta_path` (slime_like/core/slime_finder.py). Its modules
mirror slime's paths and are thin adapters over our core, buffer, rollout and trainer APIs; import them as
`slime.<module>`, never as `slime_like.compat.slime.<module>` (that would load a second copy).
"""
