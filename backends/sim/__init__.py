"""Simulated backends: an SGLang replica (``server.create_app``) and a hosted model (``hosted.create_hosted_app``).

See CONTRACT.md for what was checked against SGLang and what is approximated.
"""
