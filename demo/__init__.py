"""The closed loop: `tracetrain demo` (agents improving from their own traffic) and
`tracetrain eval` (held-out accuracy of a registered version or the base model)."""
