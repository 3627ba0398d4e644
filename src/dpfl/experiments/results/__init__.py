"""The results side: the results store a study's runs write (`store`), what is read
back from it (`queries`, `summary`, `best`), the datasheet and the report."""
