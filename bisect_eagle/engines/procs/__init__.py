"""Server processes: a free port, a supervised process group that dies with its controller, reaping
of dead controllers' servers, GPU release.
"""
