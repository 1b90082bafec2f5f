"""fslab's built-in plugins, registered through entry points like any third-party package."""
