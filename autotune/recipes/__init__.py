"""Recipes: the frozen, self-describing result (schema, load, write), warm starts from kept recipes, and
verification by re-measuring."""
