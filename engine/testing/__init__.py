"""Test kits for plugin authors. ``engine.testing.conformance`` is the backend conformance suite
(import it into a pytest module; see docs/plugins.md). Importing this package needs pytest."""
