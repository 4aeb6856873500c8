"""``python -m roles.edge.launcher``: how a device's service manager starts the launcher."""

from roles.edge.launcher.launcher import main

if __name__ == "__main__":
    raise SystemExit(main())
