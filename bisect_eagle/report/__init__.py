"""A study's report: tables and plots from its MLflow runs (`study`), the throughput model's
predicted-versus- measured view (`model`).
"""
