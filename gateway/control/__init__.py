"""The config: parsed and validated, applied live as numbered versions, and the catalog each version builds."""
