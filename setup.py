from setuptools import find_packages, setup

setup(
    name="megatron_zeppelin",
    version="0.1.0",
    description="Zeppelin (arXiv 2509.21841) for Megatron-Core: hierarchical sequence partitioning, "
                "multi-NIC routing and attention/MLP remapping for variable-length data-parallel training",
    packages=find_packages(include=["megatron_zeppelin", "megatron_zeppelin.*"]),
    python_requires=">=3.11",
    # presets (hardware profiles, models, datasets, run matrices) and the SLURM job template with its
    # env.sh are read through importlib.resources
    package_data={"megatron_zeppelin.presets": ["*/*.yaml"],
                  "megatron_zeppelin.slurm": ["templates/job.sbatch.tmpl", "templates/env.sh"]},
    install_requires=[
        "torch>=2.4",
        "megatron-core>=0.16.1",
        "numpy>=1.24",
        "PyYAML>=6",
        "rich>=13",
        "matplotlib>=3.7",
        "psutil>=5",  # megatron-core's dist_checkpointing writer measures memory with it
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "scipy>=1.10", "tensorboard>=2.14", "tokenizers>=0.15"],
        "gpu": ["transformer-engine[pytorch]", "flash-attn"],
    },
    entry_points={"console_scripts": ["zeppelin=megatron_zeppelin.cli:main"]},
)
