"""Configs that ship with spillgate: the embedded demo (``demo.yaml``), and Prometheus and Grafana examples.

Installed as ``spillgate.config``, so ``spillgate serve`` finds its demo in a wheel as in a checkout."""
