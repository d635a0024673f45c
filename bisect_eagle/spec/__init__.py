"""What the user asked for: the spec schema with its rules (`schema`), loading (`load`), live
settings (`settings`), and the checks of the inputs it names (`checks`).
"""
