"""Who may do what, how often: admin credentials and scopes (static and OIDC), per-caller rate limits."""
