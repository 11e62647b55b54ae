"""Who is asking and what proves it: caller addresses, signed proxy claims, IMDSv2 tokens, server keys."""
