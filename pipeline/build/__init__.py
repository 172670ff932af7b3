"""Build work: plan a cell's image, render its Dockerfile, bootstrap the base, lock the wheel set and build the
image."""
