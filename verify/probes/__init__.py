"""Scripts copied into an image or run on a GPU host (stdlib, or torch where the host has it); imported by
nothing in verify/ at run time."""
