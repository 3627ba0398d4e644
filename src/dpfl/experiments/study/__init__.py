"""The study side: a study file read and checked (`config`), its data (`datasets`), a
point's model and algorithm (`build`), and the commands that run it."""
