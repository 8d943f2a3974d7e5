"""What `commlib bench --import user_algorithm_plugin` imports in every rank: registering the
user-defined algorithms is the module's whole job."""
import user_algorithms

user_algorithms.register()
