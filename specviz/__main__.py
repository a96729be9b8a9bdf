from specviz.cli import main_exit

main_exit()
