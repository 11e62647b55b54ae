"""Pure renderers: ``Instance`` → documents or trees, shared by every flavor and the config drive."""
