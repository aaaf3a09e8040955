"""mover inside the frameworks a project already changes its schema with. Each integration is
optional: importing one needs its framework, installed with the package's extra of that name."""
