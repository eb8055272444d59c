"""Text devplug writes: request strings made safe to log and echo, and the compact JSON of its hot-path files."""
