"""The one docker module: the client every docker command line goes through, and gc of what stackproof created."""
