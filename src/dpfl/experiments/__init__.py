"""Studies: TOML configs, sweeps over grids and trials, the results store, the budget
lookup, reports and the seed papers' recipes. Imports the layers below; none imports it."""
