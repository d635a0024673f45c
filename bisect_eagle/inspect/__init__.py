"""Which target layer a dumped tensor came from (`bisect-eagle fingerprint`): the matcher and the
capture-only server it reads.
"""
