"""A generation request's path: handler, admission, forwarding, relay, and the upstream each backend kind serves."""
