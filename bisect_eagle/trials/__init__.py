"""One trial and its record: a live trial (`live`), a standalone trial (`standalone`, with
`accuracy`), and the schema of a trial's MLflow run (`record`).
"""
