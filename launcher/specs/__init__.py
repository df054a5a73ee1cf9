"""What a run is before it is placed: its recipe or script (the recipe format, the frameworks a script
imports), its code plan, its name, the user's variables, its spec, and the container it becomes."""
