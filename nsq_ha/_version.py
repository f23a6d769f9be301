"""Version of the nsq_ha package (read by the build backend)."""

__version__ = "0.1.0.dev0"
