from e2e.sim.fixtures import sim, sim_factory, thread_sim_factory

__all__ = ["sim", "sim_factory", "thread_sim_factory"]
