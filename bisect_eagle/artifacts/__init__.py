"""What a deployment is made of: layers and their ids, wiring rules, the target and draft on disk,
dumps, prompts, devices, the shipped scenarios.
"""
