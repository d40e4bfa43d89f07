"""The engine as a package and as a user meets it: the packages' floors, the reusable app
and safe defaults, the demo, the CLI as processes, two checkouts on one server, a smoke test."""
