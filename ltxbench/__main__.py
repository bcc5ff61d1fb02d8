from ltxbench.cli import main

main()
