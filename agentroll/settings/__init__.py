"""The settings' value objects the parts share, declared once with their defaults (`declare`: the `option(...)`
field helper)."""
