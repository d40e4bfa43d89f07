"""The operator console and the dashboard, with and without a browser, and at scale."""
