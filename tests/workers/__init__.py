"""The worker runtime: real clusters, their reliability and parent death, the hot path
(notifications, waking, one-message writes, eager children, prepared statements),
telemetry, and long polls behind a real server."""
