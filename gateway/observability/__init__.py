"""What operators watch: Prometheus metrics and the dashboard page."""
